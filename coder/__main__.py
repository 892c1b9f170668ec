from coder.cli import main

main()
