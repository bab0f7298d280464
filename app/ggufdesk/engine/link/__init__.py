"""The link between the app and the engine process: the protocol, the client (parent side), the lifeline."""
