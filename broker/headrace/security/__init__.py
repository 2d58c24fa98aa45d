"""Access control: principals, ACL grants and signed member identities (pure, no I/O).

``acl`` parses the ACL file's document and answers "may this principal do this to that
topic"; ``identities`` signs and verifies member identity tokens. The broker's adapter
(``headrace.broker.access``) reads the files, keeps the cluster key and counts denials.
"""
