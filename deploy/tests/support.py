"""What the offline checks share: the repository's root, and the optional parsers (installed by scripts/test
into <target>/checks-venv; run directly without them, the checks that need one are skipped, saying so)."""

import json
import os
import re

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
INSTALL_HINT = "run scripts/test, which installs the checks' parsers into <target>/checks-venv"


def path(*parts):
    return os.path.join(ROOT, *parts)


def read(*parts):
    with open(path(*parts), encoding="utf-8") as f:
        return f.read()


def read_json(*parts):
    return json.loads(read(*parts))


def without_line_comments(text):
    """Bicep / shell text without // or # comments, for checks that must not match what a comment says."""
    return "\n".join(re.sub(r"(//|#).*$", "", line) for line in text.splitlines())
