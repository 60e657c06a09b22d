"""What the integrations users import (:mod:`blobsdk.fsspec`, :mod:`blobsdk.torch`,
:mod:`blobsdk.dcp`) are built from.  Import those modules, not these: the names here may
move between releases."""
