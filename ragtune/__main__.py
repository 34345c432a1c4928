from ragtune.cli import main

main()
