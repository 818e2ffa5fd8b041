"""The auth service: users, logins, bearer tokens and roles."""
