"""Official SDKs and frameworks against a real server: what each one does with every
recording and every fault, stated as assertions."""
