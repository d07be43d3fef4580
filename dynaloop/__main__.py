from dynaloop.cli import main

main()
