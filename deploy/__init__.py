"""Provisioning code shared by the network-namespace test harness and the Vagrantfile.

Standard library only: it also runs with the system ``python3`` of a freshly booted VM.
"""
