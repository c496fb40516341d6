module xagent.example/xagentvalidate

go 1.19
