"""Test helpers and the independent oracles the tests hold the product to (importable as `support`)."""
