from ponytail.entry import main

raise SystemExit(main())
