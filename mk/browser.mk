# browser: see the Makefile. Fragments append to TEST_PREREQS (made before the
# main pytest run) and TEST_AFTER (targets run after it, still part of make test).
#
# tests/test_view.py opens the attention page (edge_demo/view/page.py) in headless
# Chromium driven by Selenium (the `test` extra) with Debian's chromium and
# chromium-driver. `browser` installs them with apt-get when they are missing
# and we are root. When it cannot, it says why: a strict run (CI=true or
# KERAS_MHA_STRICT=1) stops there; otherwise make goes on and the browser
# tests skip with that reason (make test's table then shows none ran).

.PHONY: browser

BROWSER_THEN = $(if $(STRICT),a strict run stops here (KERAS_MHA_STRICT=0 goes on; the browser tests then skip),tests/test_view.py's browser tests will skip)

browser:
	@command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 && exit 0; \
	if [ "$$(id -u)" != 0 ]; then why="not root, so apt-get cannot install them"; \
	elif ! command -v apt-get >/dev/null 2>&1; then why="no apt-get to install them"; \
	elif apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null \
	  && command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then exit 0; \
	else why="apt-get install chromium chromium-driver failed"; fi; \
	echo "make browser: Debian's chromium and chromium-driver are missing ($$why); $(BROWSER_THEN)" >&2; \
	$(if $(STRICT),exit 1,true)

TEST_PREREQS += browser
