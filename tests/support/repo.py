"""Where the repository's parts are, for tests that start scripts, read the docs or walk the package."""
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "tests" / "support"
