from kaudit.cli import main

main()
