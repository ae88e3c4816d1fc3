"""Sans-IO core of the replication layer.

Plain Python objects fed events and returning values; no sockets, no proton, no threads, no logging. The proton
handlers in ``ha/`` translate between the wire and these objects.

Modules:
- ``states``: HA states, roles and the transition table (``transition``).
- ``idset``: ``PositionSet``, sets of queue positions stored as ranges (also the wire form of position sets).
- ``catchup``: the catch-up plan of one queue for one backup, and its progress (``QueueCatchup``).
- ``guards``: ``GuardBook``, the primary's delayed-completion bookkeeping.
- ``lag``: ``LagSampler``, which acknowledgements become ``ha.lag`` samples.
- ``membership``: ``Member`` / ``Membership``, the member list the primary sends to backups.
- ``epoch``: ranking by (epoch, position) and the peer-epoch check.
"""
