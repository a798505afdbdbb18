"""Distributed machinery: parallel layout (DeviceMesh), ZeRO sharding, launch helpers."""
