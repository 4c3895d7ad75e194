"""The voice front ends: one transcription, synthesis sentence by sentence, and the Wyoming
server."""
