"""Access control: principals, ACL grants and signed member identities.

The pure core: ``acl`` parses the ACL file's document and answers "may this principal
do this to that topic"; ``identities`` signs and verifies member identity tokens;
``keyrings`` reads the token and key files' format; ``scram`` is the server side of a
SASL/SCRAM exchange and the credentials it checks. ``settings`` holds what access
control is configured with (``AccessSettings``, ``TlsSettings``, ``AdminReadAccess``).

The adapters around it: ``access`` reads the files, keeps the cluster key and counts
denials; ``reloading`` re-reads every credential file without a restart;
``admin_access`` puts the same checks on an admin HTTP port (aiohttp), the broker's and
the controller's.
"""
