from moebench.cli import main

main()
