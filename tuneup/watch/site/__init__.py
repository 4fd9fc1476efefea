"""A folder ``tuneup watch`` puts first on a started job's ``PYTHONPATH`` (see
:mod:`tuneup.watch.plain_probe`); only its ``sitecustomize`` is meant to be imported."""
