from fairlane.cli import main

raise SystemExit(main())
