"""What a test or lint command said, read the same way by steps, `merge --if-green` and `init`.

    testcommand.py  which command runs a project's tests, guessed from its files
    testreport.py   the test command a step runs, and what its output says
    testresults.py  machine-readable test results where the runner offers them, text where not
    testrunner.py   `python -m unittest`, counted (run as a script inside the sandbox)
    lintreport.py   which linter checks a file, and what its output says (verdicts, formats)

May import: the base modules (errors, files, display, ...) and config.
"""
