"""Facts about a machine, read by the doctor, the settings fingerprint, autotune and watch:
the plain-data :mod:`snapshot`, the live :mod:`probe`, and :mod:`versions`."""
