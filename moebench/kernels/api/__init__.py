"""The arm API: what an arm is (Arm, PreparedCall), its declared parity oracle, and arms a user
brings from a module of their own. The CUDA and stock arms build on it; the registry above
collects them."""
