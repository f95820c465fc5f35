import sys

from devplugin.cli import main

sys.exit(main())
