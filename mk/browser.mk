# browser: see the Makefile. Fragments append to TEST_PREREQS (made before the
# main pytest run) and TEST_AFTER (targets run after it, still part of make test).
#
# tests/test_view.py opens the attention page (edge_demo/view.py) in headless
# Chromium driven by Selenium (the `test` extra) with Debian's chromium and
# chromium-driver. `browser` installs them with apt-get when they are missing
# and we are root; otherwise it says why and the test skips with that reason.
# Already installed, or not root: nothing changes, and make goes on.

.PHONY: browser

browser:
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then \
	  :; \
	elif [ "$$(id -u)" != 0 ]; then \
	  echo "browser: chromium/chromedriver missing and not root; tests/test_view.py will skip"; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
	  echo "browser: chromium/chromedriver missing and no apt-get; tests/test_view.py will skip"; \
	else \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; } \
	    || echo "browser: apt-get install chromium chromium-driver failed; tests/test_view.py will skip"; \
	fi

TEST_PREREQS += browser
