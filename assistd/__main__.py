from assistd.cli import main

main()
