-- The names of corral's users, for the frontend (issue 12): adding a
-- member who is not a user (AddMember, CreateBillingProject's members) is
-- NOT_FOUND, checked in the transaction that adds them, so a member list
-- never names someone who does not exist. The frontend and the driver may
-- not read `users` itself (password hashes, services/db/accounts.py): this
-- view shows them the usernames alone, with its definer's rights.
CREATE SQL SECURITY DEFINER VIEW usernames AS
  SELECT username FROM users;
