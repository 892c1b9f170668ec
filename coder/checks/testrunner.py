"""`python -m unittest ARGS`, counted: run as a script (`python /path/to/testrunner.py ARGS`)
by the project's own Python, it runs unittest exactly as `python -m unittest ARGS` would (same
output, same exit code) and writes the counts as JSON to the file `$CODER_TEST_RESULTS` names:
{"passed", "failed", "errors", "skipped", "ran"}.

Counted by the result object, test by test, not from the "Ran N" line: Python 3.12.0 and
3.12.1 leave skipped tests out of `testsRun`, so a run of one passing and one skipped test
printed "Ran 1" there; here it is 1 passed, 1 skipped on every version. Expected failures count
as skipped and unexpected successes as failed (as coder.checks.testreport counts the text).

Standard library only, and no import of coder: the project's interpreter need not have coder
installed.
"""

from __future__ import annotations

import json
import os
import sys
import unittest
from typing import Any

RESULTS_VAR = "CODER_TEST_RESULTS"


class CountingResult(unittest.TextTestResult):
    """unittest's own text result, counting each outcome as it is reported."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.passes = 0

    def addSuccess(self, test: unittest.TestCase) -> None:  # noqa: N802 - unittest's name
        super().addSuccess(test)
        self.passes += 1

    def stopTestRun(self) -> None:  # noqa: N802
        super().stopTestRun()
        path = os.environ.get(RESULTS_VAR)
        if not path:
            return
        counts = {
            "passed": self.passes,
            "failed": len(self.failures) + len(self.unexpectedSuccesses),
            "errors": len(self.errors),
            "skipped": len(self.skipped) + len(self.expectedFailures),
            "ran": self.testsRun,
        }
        with open(path, "w", encoding="utf-8") as out:
            json.dump(counts, out)


class CountingRunner(unittest.TextTestRunner):
    resultclass = CountingResult


def main() -> None:
    sys.argv[0] = "python -m unittest"  # as unittest's own __main__ names itself in --help
    sys.path.insert(0, os.getcwd())  # `python -m` puts the working directory first
    unittest.main(module=None, testRunner=CountingRunner)


if __name__ == "__main__":
    sys.path.pop(0)  # the script's own directory (coder's package) is no place to import from
    main()
