"""Model backends, one module per engine, grouped by stage."""
