"""Running nets: the Workspace and its blobs, the executor (bind a NetDef once, then a flat run loop), plans,
and profiling. Whether a net runs op by op or through the compiled runner (stepnet.compiled) is decided here."""
