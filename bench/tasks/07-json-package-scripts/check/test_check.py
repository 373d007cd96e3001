"""Hidden check: jest moved to devDependencies, lint script added, everything else unchanged."""

import json


def load() -> dict:
    with open("package.json", encoding="utf-8") as handle:
        return json.load(handle)


def test_jest_moved_with_same_version():
    package = load()
    assert package["dependencies"] == {"express": "^4.19.2", "node-html-parser": "^6.1.13"}
    assert package["devDependencies"] == {"jest": "^29.7.0", "prettier": "^3.3.3"}


def test_lint_script_added():
    assert load()["scripts"] == {"start": "node src/server.js", "test": "jest", "lint": "eslint src"}


def test_other_fields_unchanged():
    package = load()
    for key in ("scripts", "dependencies", "devDependencies"):
        package.pop(key)
    assert package == {
        "name": "link-preview",
        "version": "0.3.0",
        "private": True,
        "description": "Fetches a page and returns its title, description and image for link previews.",
        "main": "src/server.js",
        "engines": {"node": ">=20"},
    }
