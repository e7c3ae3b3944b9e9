"""setup.py: records, at build time, which checkout the package was installed from, so an
installed (non-editable) package can still find <repo>/build/libgdp.so. Everything else
is in pyproject.toml."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SOURCE_ROOT = Path(__file__).resolve().parent.parent  # <repo>/python/setup.py -> <repo>


class build_py_with_source_root(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install imports python/gdp in place and finds the tree itself
        target = Path(self.build_lib) / "gdp" / "_build_info.py"
        target.write_text('"""_build_info.py: written by setup.py at install time."""\n'
                          f"SOURCE_ROOT = {str(SOURCE_ROOT)!r}\n")


setup(cmdclass={"build_py": build_py_with_source_root})
