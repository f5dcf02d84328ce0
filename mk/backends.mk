# backends: see the Makefile. Fragments append to TEST_PREREQS (made before the
# main pytest run) and TEST_AFTER (targets run after it, still part of make test).
