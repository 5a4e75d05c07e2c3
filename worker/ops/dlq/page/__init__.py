"""``worker dlq ui``: a read-only page over the DLQ and the audit record.

Standard library only. ``reading`` makes a view's pass over the queue the way ``list`` makes it (each message
held unacked only while the page is built, then put back in order) and reads the audit history; ``views``
(with ``markup`` and ``charts``) builds the HTML; ``auth`` is the token and the names the page answers to;
``server`` the HTTP server, a thread per connection calling back into the command's event loop; ``command``
is ``worker dlq ui`` itself. Nothing here acks a message: the page never replays or deletes.
"""
