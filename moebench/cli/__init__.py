"""The command line: thin click commands over the library, one console module for what they print."""
