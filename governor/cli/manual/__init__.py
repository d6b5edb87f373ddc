"""The manual's generated parts, so that they cannot drift from the program (issue 34):

- ``governor(1)`` from the click command tree the typer app builds (manpage.py),
- ``governor.toml(5)`` and docs/reference/policy.md from the policy's JSON Schema (the pydantic
  models, ``governor schema``) and the key descriptions in keys.py (policyref.py),
- the bash, zsh and fish completion scripts (click's, for the program name ``governor``).

``python -m governor.cli.manual`` writes them into the source tree (share/, docs/reference/);
``--check`` exits 1 and names every file that is not current (tests/unit/manual runs it). The
package data files (pyproject.toml) install share/ into the environment's share/. Nothing at
run time imports this package.
"""
