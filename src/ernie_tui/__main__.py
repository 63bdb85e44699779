from ernie_tui.cli import main

raise SystemExit(main())
