"""Command-line entry points: thin layers that parse options, call one library function and print. Commands
check their optional extra first, and import the library lazily so each loads only what it needs.

May import: everything.
"""
