"""Native code verispec builds on the user's machine: llama.cpp (the bench peers and the llama.cpp model backend)."""
