from .cli.run import main

raise SystemExit(main())
