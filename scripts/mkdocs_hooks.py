"""mkdocs hook (``hooks:`` in mkdocs.yml): adds the pages written from the code to the site.

Generated on every build instead of committed, so they cannot fall behind what they describe:
the front page (README.md, its links into docs/ made site links), the configuration reference
(:mod:`config_reference`), the plugin kinds and one page per plugin package
(:mod:`plugin_pages`), each listed in the navigation under "Plugins".
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

sys.path.insert(0, str(Path(__file__).resolve().parent))

import config_reference
import plugin_pages

PLUGINS_SECTION = "Plugins"


def front_page() -> str:
    readme = (plugin_pages.ROOT / "README.md").read_text()
    return readme.replace("](docs/", "](").replace("[docs/](docs/)", "docs/")


def on_config(config: Any) -> Any:
    """Each plugin package's page under "Plugins", after the section's index page."""
    for section in config["nav"]:
        if isinstance(section, dict) and PLUGINS_SECTION in section:
            section[PLUGINS_SECTION] += [
                {package_name(folder): f"plugins/{folder.name}.md"}
                for folder in plugin_pages.plugin_folders()
            ]
    return config


def package_name(folder: Path) -> str:
    return (folder / "README.md").read_text().splitlines()[0].removeprefix("# ").strip()


def on_files(files: Files, config: Any) -> Files:
    pages = {
        "index.md": front_page(),
        "reference/configuration.md": config_reference.render(),
        "writing-plugins/kinds.md": plugin_pages.kinds_page(),
    }
    rows = plugin_pages.support_rows()
    for folder in plugin_pages.plugin_folders():
        pages[f"plugins/{folder.name}.md"] = plugin_pages.plugin_page(folder, rows)
    for path, content in pages.items():
        files.append(File.generated(config, path, content=content))
    return files
