from coder.cli import main

main(prog_name="coder", complete_var="_CODER_COMPLETE")  # as the `coder` script is
