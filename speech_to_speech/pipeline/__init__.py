"""Putting the wings together: the backend registry, the command line, the one pipeline builder
(``builder``), the running pipeline (``running``) and the local console. Imports the wings below it,
never ``realtime`` or ``client``."""
