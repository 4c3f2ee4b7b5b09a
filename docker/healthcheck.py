"""Container health check: exit 0 when berth's /readyz answers 200, else 1.

Used by the images' HEALTHCHECK and compose's healthcheck. Standard library only (the slim image has
no curl). The port is BERTH_PORT (default 8000); BERTH_HEALTHCHECK_URL overrides the whole URL.
"""

import os
import sys
import urllib.error
import urllib.request


def main() -> int:
    port = os.environ.get("BERTH_PORT", "8000")
    url = os.environ.get("BERTH_HEALTHCHECK_URL", f"http://127.0.0.1:{port}/readyz")
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return 0 if response.status == 200 else 1
    except (urllib.error.URLError, OSError) as error:  # HTTPError (503 while warming up) is a URLError
        print(f"not ready: {url}: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
