"""``python -m mv_assets ...``: the ``mv-assets`` command line (mv_assets.cli)."""

from mv_assets.cli import main

if __name__ == "__main__":
    main(prog_name="mv-assets")
