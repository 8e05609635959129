"""The narrated demos behind ``deferq demo`` and ``deferq queue-demo``. Nothing in the library imports them."""
