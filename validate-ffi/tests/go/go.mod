module xagent.example/validatecheck

go 1.19
