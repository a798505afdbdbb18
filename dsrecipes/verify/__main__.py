"""`python -m dsrecipes.verify RECIPE_OVERRIDES [verify.KEY=VALUE ...]`: see dsrecipes.verify.cli."""

import sys

from dsrecipes.verify.cli import main

sys.exit(main())
