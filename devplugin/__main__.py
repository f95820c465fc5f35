import sys

from devplugin.app.cli import main

sys.exit(main())
