"""What a sweep stored: records.jsonl, the best per problem, and the tables and plots made from them."""
