"""The engine process itself: its main loop, llama.cpp through ctypes, memory limits, devices, RPC, chat templates."""
