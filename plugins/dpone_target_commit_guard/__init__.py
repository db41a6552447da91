"""First-party target-commit guard plugin for dpone-native-transfer.

Registered only through the ``dpone_native_transfer`` entry-point group; the
runtime never imports it.
"""
