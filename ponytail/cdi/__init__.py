"""Container Device Interface: the Plan rendered as a CDI spec (``spec``), written, listed and
checked (``files``), and the one createContainer hook the spec names (``hook``)."""
