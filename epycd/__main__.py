from epycd.cli import main

main()
