"""Nets as graphs, without knowing any operator: a read-only view of a NetDef (versions, producers, consumers,
nested nets) and rewrites that return new NetDefs, among them what RecurrentNetwork does to its step nets."""
