"""``worker dlq ui``: a page over the DLQ and the audit record, with buttons that start operations.

Standard library only. ``reading`` makes a view's pass over the queue the way ``list`` makes it (each message
held unacked only while the page is built, then put back in order) and reads the audit history; ``views``
(with ``markup`` and ``charts``) builds the HTML; ``auth`` is the token and the names the page answers to;
``server`` the HTTP server, a thread per connection calling back into the command's event loop; ``buttons``
the confirmations and the forms, whose replays and purges run as ``worker dlq`` processes of their own;
``command`` is ``worker dlq ui`` itself. Nothing here acks a message: only those processes move letters.
"""
