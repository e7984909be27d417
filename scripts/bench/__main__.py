from scripts.bench.cli import main

raise SystemExit(main())
