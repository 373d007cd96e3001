"""`openjet bench tasks`: repeatable coding tasks run through the headless agent, scored by hidden checks."""
