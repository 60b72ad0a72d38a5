from moebench.cli.main import main

if __name__ == "__main__":  # not in a worker process started by spawn (workers.local)
    main()
